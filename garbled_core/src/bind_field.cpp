// Python bindings of the prime-field kernels; see bind_field.h. Every array crosses as uint64
// values in [0, p); a value outside is a ValueError, never a silent reduction.
#include "garbled_core/bind_field.h"

#include <pybind11/numpy.h>

#include <string>

#include "garbled_core/field.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

void check_reduced(const U64Array& a, uint64_t p, const char* what) {
  const uint64_t* v = a.data();
  for (py::ssize_t i = 0; i < a.size(); ++i) {
    if (v[i] >= p) {
      throw py::value_error(std::string(what) + " holds a value >= the field modulus " +
                            std::to_string(p));
    }
  }
}

std::string seed_bytes(const py::bytes& seed) {
  std::string s = seed;
  if (s.size() != 16) throw py::value_error("seed must be 16 bytes, got " + std::to_string(s.size()));
  return s;
}

U64Array field_ntt(const U64Array& values, uint64_t p, uint64_t root) {
  gc::PrimeField f(p);
  if (values.ndim() != 2) throw py::value_error("field_ntt expects a 2-D array (rows, n)");
  check_reduced(values, p, "values");
  size_t rows = values.shape(0), n = values.shape(1);
  U64Array out({(py::ssize_t)rows, (py::ssize_t)n});
  std::copy(values.data(), values.data() + values.size(), out.mutable_data());
  if (root >= p) throw py::value_error("root must be below the field modulus");
  if (n && f.pow(root, n) != 1) throw py::value_error("root is not an n-th root of unity");
  uint64_t* data = out.mutable_data();
  {
    py::gil_scoped_release release;
    gc::ntt_rows(f, data, rows, n, root);
  }
  return out;
}

U64Array field_matvec(const U64Array& m, const U64Array& v, uint64_t p) {
  gc::PrimeField f(p);
  if (m.ndim() != 2 || v.ndim() != 1 || m.shape(1) != v.shape(0)) {
    throw py::value_error("field_matvec expects m (rows, n) and v (n,)");
  }
  check_reduced(m, p, "m");
  check_reduced(v, p, "v");
  size_t rows = m.shape(0), n = m.shape(1);
  U64Array out((py::ssize_t)rows);
  const uint64_t *mp = m.data(), *vp = v.data();
  uint64_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    gc::matvec(f, mp, rows, n, vp, o);
  }
  return out;
}

U64Array field_mul(const U64Array& a, const U64Array& b, uint64_t p) {
  gc::PrimeField f(p);
  if (a.ndim() != 1 || b.ndim() != 1 || !(b.shape(0) == a.shape(0) || b.shape(0) == 1)) {
    throw py::value_error("field_mul expects a (n,) and b (n,) or (1,)");
  }
  check_reduced(a, p, "a");
  check_reduced(b, p, "b");
  size_t n = a.shape(0), stride = (b.shape(0) == 1 && n != 1) ? 0 : 1;
  U64Array out((py::ssize_t)n);
  const uint64_t *ap = a.data(), *bp = b.data();
  uint64_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    gc::mul_vectors(f, ap, bp, stride, n, o);
  }
  return out;
}

U64Array field_expand(const py::bytes& seed, size_t n, uint64_t p) {
  gc::PrimeField f(p);
  std::string s = seed_bytes(seed);
  U64Array out((py::ssize_t)n);
  uint64_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    gc::expand_field_elements(f, reinterpret_cast<const uint8_t*>(s.data()), n, o);
  }
  return out;
}

U64Array wraparound_dots(const U64Array& x, const py::bytes& seed, size_t reps, uint64_t p) {
  gc::PrimeField f(p);
  if (x.ndim() != 1) throw py::value_error("wraparound_dots expects a 1-D vector");
  check_reduced(x, p, "x");
  std::string s = seed_bytes(seed);
  U64Array out((py::ssize_t)reps);
  const uint64_t* xp = x.data();
  uint64_t* o = out.mutable_data();
  size_t n = x.shape(0);
  {
    py::gil_scoped_release release;
    gc::wraparound_dots(f, xp, n, reinterpret_cast<const uint8_t*>(s.data()), reps, o);
  }
  return out;
}

}  // namespace

void bind_field(py::module_& m) {
  m.def("field_ntt", &field_ntt, "values"_a, "p"_a, "root"_a,
        "Each row's number theoretic transform mod p (root: a primitive n-th root of unity).");
  m.def("field_matvec", &field_matvec, "m"_a, "v"_a, "p"_a, "m @ v mod p.");
  m.def("field_mul", &field_mul, "a"_a, "b"_a, "p"_a, "a * b mod p, elementwise (b: one value or n).");
  m.def("field_expand", &field_expand, "seed"_a, "n"_a, "p"_a,
        "n uniform elements of [0, p) from the AES-CTR stream of a 16-byte seed.");
  m.def("wraparound_dots", &wraparound_dots, "x"_a, "seed"_a, "reps"_a, "p"_a,
        "<z_k, x> mod p for the reps {-1, 0, 1} vectors z_k drawn from a 16-byte seed.");
}
