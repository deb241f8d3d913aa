// Placeholder: implemented by the quant work.
#include "quant/quant.h"
namespace geist::quant {
float fp16_to_fp32(uint16_t) { return 0; }
uint16_t fp32_to_fp16(float) { return 0; }
bool dequantize_row(GgmlType, const void *, float *, int64_t) { return false; }
}  // namespace geist::quant
