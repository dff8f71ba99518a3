"""homelab.hardware"""
