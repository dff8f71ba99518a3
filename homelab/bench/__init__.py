"""homelab.bench"""
