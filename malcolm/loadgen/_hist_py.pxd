# cython: language_level=3
from malcolm._hist cimport Hist

cdef object hist_py(Hist* h)
