"""The codec: JPEG decoders (Pillow, the GPU decoders behind one interface), the resize
core, normalize; batched on the CPU or CUDA."""
