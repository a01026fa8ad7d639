"""Facts about the machine and the process: usable CPUs, the memory allocator, shared ports."""
