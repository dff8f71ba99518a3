"""homelab.server"""
