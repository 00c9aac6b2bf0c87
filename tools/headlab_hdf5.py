"""HDF5 details shared by the tools in this folder: the identifiers of headlab's checkpoint format
(export_torch.py reads them, import_torch.py writes them), reading a string attribute, and the
libhdf5 property setters that h5py 3.7 does not wrap (fixtures_common.py and import_torch.py use them
to keep group links compact and dataset headers small), called through ctypes.

Needs h5py and numpy, not torch.
"""
import ctypes
import ctypes.util

import h5py  # loads libhdf5: the ctypes calls below go to that same library
import numpy as np

CHECKPOINT_FORMAT = "headlab-checkpoint"  # root attribute "format" of a headlab checkpoint
CHECKPOINT_VERSION = 1  # root attribute "format_version" (int64)
HDF5_VERSION = h5py.version.hdf5_version  # of the libhdf5 that h5py (and the ctypes calls) use


def attr_str(obj, key):
    """The string attribute `key` of an h5py object, whichever way it is stored (fixed-length
    NUL-padded or variable-length; bytes or str)."""
    v = obj.attrs[key]
    if isinstance(v, np.ndarray) and v.shape == ():
        v = v[()]
    if isinstance(v, bytes):
        v = v.rstrip(b"\0").decode("utf-8")
    return str(v)


def _load_hdf5():
    """The libhdf5 that h5py loaded (property-list ids are only valid in that library): the one in
    this process's memory map, else the usual sonames; None if none loads."""
    try:
        with open("/proc/self/maps") as maps:
            names = sorted({line.split()[-1] for line in maps
                            if "libhdf5" in line and "_hl" not in line and ".so" in line})
    except OSError:
        names = []
    names += ["libhdf5_serial.so.103", ctypes.util.find_library("hdf5_serial"), ctypes.util.find_library("hdf5")]
    for name in names:
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    return None


_LIB = _load_hdf5()


def _call(fn_name, plist, *args):
    """fn_name(plist, unsigned...) on a property list; False (nothing done) where unavailable."""
    fn = getattr(_LIB, fn_name, None) if _LIB is not None else None
    if fn is None:
        return False
    return fn(ctypes.c_int64(plist.id), *[ctypes.c_uint(a) for a in args]) >= 0


def set_link_phase_change(plist, max_compact, min_dense):
    """H5Pset_link_phase_change on a group- or file-creation property list: up to max_compact links
    stay in the group's object header (compact, checksummed) instead of a fractal heap. Returns
    whether it was set (where it is not, the file is still valid, with HDF5's defaults)."""
    return _call("H5Pset_link_phase_change", plist, max_compact, min_dense)


def set_dset_no_attrs_hint(plist, minimize=True):
    """H5Pset_dset_no_attrs_hint on a dataset-creation property list: a minimal object header for
    datasets that get no attributes. Returns whether it was set."""
    return _call("H5Pset_dset_no_attrs_hint", plist, int(minimize))
