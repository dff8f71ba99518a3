"""Images a chat brings: decoded, checked and hashed before any model memory is committed.

A leaf package (no llama.cpp, no server): the server's dialects decode what the wire carries
into :class:`~homelab.images.decoded.DecodedImage`, and the engine hands those pixels to the
vision projector.
"""
