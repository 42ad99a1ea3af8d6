"""Reading a pack to a device: the loader, epoch orders, the producer that gathers,
pins and copies batches, the device gather, and the map-style dataset."""
