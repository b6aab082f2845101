"""What the Ascend mhc kernels share (build time only): the column chunk a step works on."""

CHUNK = 1024  # columns of a token a step (the copies bound the last chunk at H)
THREADS = 128  # SIMT threads, each over every THREADS-th column of a chunk
STEPS = CHUNK // THREADS
