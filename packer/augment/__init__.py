"""Per-image random augmentation: ops as classes over explicit-parameter kernels, and the
geometry that moves boxes, masks and keypoints with their image (``dense*``)."""
