"""What comes in: scanning a tree of images, the class map and label tables.

Nothing here decodes a pixel or writes a pack.
"""
