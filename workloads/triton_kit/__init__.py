"""What the built-in Triton kernels share: jitting on first launch (:mod:`.jit`), launch grids
and output buffers (:mod:`.launch`), their config spaces and defaults (:mod:`.spaces`), and the
device's limits those spaces are held to (:mod:`.limits`).

Kernels sit below backends: the Triton backend imports these, never the other way round.
"""
