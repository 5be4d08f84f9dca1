"""cleave.runtime: compiled operators, their on-disk artifacts and cache, shape
buckets, graph breaks, the torch.compile backend and explain. Imports neither
egglog nor z3: the search is imported lazily, on a cache miss only."""
