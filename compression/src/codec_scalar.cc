// Scalar codec kernels: the reference the SIMD kernels must match bit for bit.
#include "codec_loops.h"

namespace tandem::codec {

const CodecKernels kScalarCodecs = {format_kernels<ScalarLanes<f16_t>>(), format_kernels<ScalarLanes<bf16_t>>()};

}  // namespace tandem::codec
