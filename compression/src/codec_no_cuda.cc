// The CUDA entry points of codec_cuda.h in a build without CUDA: they refuse.
#include <string>

#include "codec_cuda.h"
#include "tandem/errors.h"

namespace tandem::codec {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw InvalidArgument(std::string(what) + ": CUDA buffers need a build with TANDEM_WITH_CUDA=ON (and a GPU)");
}

}  // namespace

void encode_cuda(Format, const float*, uint16_t*, size_t, float, void*) { no_cuda("encode"); }
void encode_feedback_cuda(Format, float*, float*, uint16_t*, size_t, float, float, void*) {
  no_cuda("encode_feedback");
}
void decode_cuda(Format, const uint16_t*, float*, size_t, float, void*) { no_cuda("decode"); }
void nonfinite_cuda(Format, const uint16_t*, size_t, unsigned*, void*) { no_cuda("all_finite"); }
bool all_finite_cuda(Format, const uint16_t*, size_t, void*) { no_cuda("all_finite"); }
void synchronize_cuda(void*) { no_cuda("synchronize"); }

}  // namespace tandem::codec
