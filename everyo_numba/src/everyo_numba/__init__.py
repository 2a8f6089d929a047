"""everyo-numba: compiled CPU implementations of EveryO's kernels (a kernel provider).

Importing this package imports nothing heavy: the plugin (``everyo_numba.plugin``) registers
the implementations as ``"module:function"`` paths, and the kernel registry imports a module
(and with it Numba) on the first call of one of its kernels. Each function compiles on its
first call for the dtypes it meets and is cached on disk (``@njit(cache=True)``).
"""
