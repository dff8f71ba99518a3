"""homelab.planner"""
