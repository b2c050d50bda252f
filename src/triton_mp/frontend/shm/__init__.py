"""The shared memory extensions: the system and CUDA regions clients register."""
