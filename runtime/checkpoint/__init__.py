"""A checkpoint's life after the session asks for it: written to the leg's disk (`disk`: files and
manifest, snapshots), pushed through the storage cycle (`cycle`: upload, verify, delete, prune;
`node_cycle` for a sharded checkpoint written on several nodes), read back (`verify`), chosen and
restored at a resume (`restore`), and sharded state through torch.distributed.checkpoint (`dcp`).
Imports nothing from torch at package import; `disk` and `dcp` load it where they need it.
"""
