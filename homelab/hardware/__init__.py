"""homelab.hardware: what this machine has, and what the planner may assume about GPUs.

nvml.py      the one doorway to NVML (pynvml): N/A instead of exceptions, errors explained
gpu.py       GpuInfo / GpuSnapshot / GpuProcess; gpu_snapshot() for ~1 Hz polling
host.py      CpuInfo, MemoryInfo (psutil, /proc/cpuinfo, cgroup limit)
build.py     BuildInfo: the llama.cpp build (imported lazily)
report.py    HardwareReport and detect(nvml_module=None)
render.py    plain-text rendering for `homelab hw` (the verb is homelab.cli.hw)
profiles.py  GpuProfile from profiles/gpus.toml (`--gpu rtx-4090`)
"""
