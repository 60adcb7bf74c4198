# The CUDA kernel libraries, declared once for the library (comm/, compression/)
# and the self-contained GPU test tier (tests/gpu), which builds the same
# sources with the same flags and nothing else of tandem.
# Needs the CUDA language enabled and find_package(CUDAToolkit) done.
include_guard(GLOBAL)

set(TANDEM_CUDA_ARCHITECTURES "75;80;90" CACHE STRING
    "GPU architectures the CUDA kernels are built for (CMake's CUDA_ARCHITECTURES: a list, or native)")

# A static library of one .cu file; ARGN: its include folders. Paths are from the repository root.
function(_tandem_cuda_library target source)
  set(root "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/..")
  add_library(${target} STATIC ${root}/${source})
  foreach(dir IN LISTS ARGN)
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}/${dir}>)
  endforeach()
  # The static runtime: links anywhere; on a machine without a driver its calls fail cleanly.
  target_link_libraries(${target} PUBLIC CUDA::cudart_static)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${TANDEM_CUDA_ARCHITECTURES}" CUDA_STANDARD 17
                                             POSITION_INDEPENDENT_CODE ON)
endfunction()

# reduce_cuda / scale_avg_cuda / copy_cuda (comm/reduce/reduce_cuda.h).
function(tandem_reduce_cuda_library target)
  _tandem_cuda_library(${target} comm/reduce/reduce_cuda.cu comm/include comm/reduce/include comm/reduce)
endfunction()

# encode_cuda / decode_cuda / encode_feedback_cuda / all_finite_cuda (compression/src/codec_cuda.h).
function(tandem_codec_cuda_library target)
  _tandem_cuda_library(${target} compression/src/codec_cuda.cu comm/include comm/reduce/include compression/src)
  # Scaling rounds twice, never fused, as the CPU codecs built with -ffp-contract=off: the same bits.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false>)
endfunction()
