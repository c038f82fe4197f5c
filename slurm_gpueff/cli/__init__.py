"""Command-line entry points: ``seff-gpu`` (:mod:`.seff`) and the ``gpueff`` dispatcher (:mod:`.gpueff`).

Kept import-free so ``gpueff hook ...`` pays only for what the hook needs.
"""
