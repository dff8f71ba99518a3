"""homelab.tui"""
