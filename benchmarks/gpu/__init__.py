"""The H200 check: build llama.cpp with CUDA on the device machine and measure there (README.md)."""
