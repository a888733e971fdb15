// The C++ custom-ops tutorial's ops (pytorch.org/tutorials/advanced/cpp_custom_ops.html)
// with CPU kernels, for float32 and float64 (gradcheck needs float64).  Only the
// headers the kernels need: <torch/all.h> would triple the compile time, and this
// file is compiled on every CI run.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace extension_cpp {

static void check(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "extension_cpp: a and b must have the same shape");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "extension_cpp: a and b must have one dtype");
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble,
              "extension_cpp: a and b must be float32 or float64");
  TORCH_INTERNAL_ASSERT(a.device().is_cpu() && b.device().is_cpu());
}

// out[i] = a[i] * b[i] * mul + a[i] * add_a + add
template <typename T>
static void loop(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, double mul,
                 double add_a, double add_b, double add) {
  at::Tensor a_contig = a.contiguous();
  at::Tensor b_contig = b.contiguous();
  const T* a_ptr = a_contig.const_data_ptr<T>();
  const T* b_ptr = b_contig.const_data_ptr<T>();
  T* out_ptr = out.mutable_data_ptr<T>();
  for (int64_t i = 0; i < out.numel(); i++) {
    out_ptr[i] = a_ptr[i] * b_ptr[i] * static_cast<T>(mul) + a_ptr[i] * static_cast<T>(add_a) +
                 b_ptr[i] * static_cast<T>(add_b) + static_cast<T>(add);
  }
}

static void compute(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, double mul,
                    double add_a, double add_b, double add) {
  if (a.scalar_type() == at::kFloat) {
    loop<float>(a, b, out, mul, add_a, add_b, add);
  } else {
    loop<double>(a, b, out, mul, add_a, add_b, add);
  }
}

at::Tensor mymuladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  check(a, b);
  at::Tensor result = at::empty(a.sizes(), a.options());
  compute(a, b, result, 1.0, 0.0, 0.0, c);
  return result;
}

at::Tensor mymul_cpu(const at::Tensor& a, const at::Tensor& b) {
  check(a, b);
  at::Tensor result = at::empty(a.sizes(), a.options());
  compute(a, b, result, 1.0, 0.0, 0.0, 0.0);
  return result;
}

// An example of an operator that mutates one of its inputs.
void myadd_out_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check(a, b);
  TORCH_CHECK(out.sizes() == a.sizes() && out.scalar_type() == a.scalar_type(),
              "extension_cpp: out must have a's shape and dtype");
  TORCH_CHECK(out.is_contiguous(), "extension_cpp: out must be contiguous");
  compute(a, b, out, 0.0, 1.0, 1.0, 0.0);
}

// Defines the operators.  registry.py declares the same schemas, which opregistry
// reads without loading this library, and checks against it after loading it.
TORCH_LIBRARY(extension_cpp, m) {
  m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
  m.def("mymul(Tensor a, Tensor b) -> Tensor");
  m.def("myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");
}

// Registers the CPU implementations.
TORCH_LIBRARY_IMPL(extension_cpp, CPU, m) {
  m.impl("mymuladd", &mymuladd_cpu);
  m.impl("mymul", &mymul_cpu);
  m.impl("myadd_out", &myadd_out_cpu);
}

}  // namespace extension_cpp
