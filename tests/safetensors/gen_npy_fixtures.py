#!/usr/bin/python3
"""Write the small .npy fixtures of tests/safetensors/test_npy.c with NumPy itself.

Run once with /usr/bin/python3 (Debian's python3-numpy); the outputs are committed so
that CI needs neither Python nor NumPy.  The C test hardcodes the same values:
  f32_2x3     np.arange(6).reshape(2, 3) * 0.5 - 1            <f4
  f64_3       [1/3, -2.5e300, 5e-324]                        <f8
  i4_2x2x2    np.arange(8).reshape(2, 2, 2) * -3 + 7          <i4
  i8_5        [0, -1, 2**40, -(2**62), 2**63 - 1]             <i8
  u1_4        [0, 1, 200, 255]                                |u1
  b1_3        [True, False, True]                             |b1
  f32_scalar  np.float32(3.25), shape ()                      <f4
  i8_empty    shape (0, 3)                                    <i8
  v2_f32      f32_2x3 written as format version 2.0
  fortran     f32_2x3 in Fortran order (must be rejected)
  be_f4       [1, 2] as >f4 (must be rejected)
"""
import os
import numpy as np

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
os.makedirs(out, exist_ok=True)
f32 = (np.arange(6).reshape(2, 3) * 0.5 - 1).astype("<f4")
arrays = {
    "f32_2x3": f32,
    "f64_3": np.array([1 / 3, -2.5e300, 5e-324], dtype="<f8"),
    "i4_2x2x2": (np.arange(8).reshape(2, 2, 2) * -3 + 7).astype("<i4"),
    "i8_5": np.array([0, -1, 2**40, -(2**62), 2**63 - 1], dtype="<i8"),
    "u1_4": np.array([0, 1, 200, 255], dtype="|u1"),
    "b1_3": np.array([True, False, True]),
    "f32_scalar": np.array(np.float32(3.25)),
    "i8_empty": np.zeros((0, 3), dtype="<i8"),
    "fortran": np.asfortranarray(f32),
    "be_f4": np.array([1, 2], dtype=">f4"),
}
for name, a in arrays.items():
    np.save(os.path.join(out, name + ".npy"), a, allow_pickle=False)
with open(os.path.join(out, "v2_f32.npy"), "wb") as f:
    np.lib.format.write_array(f, f32, version=(2, 0), allow_pickle=False)
