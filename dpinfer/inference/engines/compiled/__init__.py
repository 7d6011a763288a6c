"""dpinfer's compiled exact Gibbs engine: the engine (:mod:`.engine`), the model's native
functions (:mod:`.model`) and their disk cache (:mod:`.cache`), the count blocks
(:mod:`.count_blocks`, :mod:`.exact_counts`), the NUTS transition (:mod:`.nuts`), the chains
(:mod:`.chains`) and the numba glue (:mod:`.native`)."""
