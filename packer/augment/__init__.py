"""Per-image random augmentation of uint8 batches, on the CPU or CUDA: the ops as classes
over batched kernels (their public names are in ``packer.transforms``), and the geometry
that moves boxes, masks and keypoints with their image (``dense*``)."""
