"""homelab.hub"""
