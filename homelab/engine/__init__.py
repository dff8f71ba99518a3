"""homelab.engine"""
