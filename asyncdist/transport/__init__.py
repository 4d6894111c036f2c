"""Byte streams between ranks: connecting with a handshake, and framed streams."""
