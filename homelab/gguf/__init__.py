"""homelab.gguf"""
