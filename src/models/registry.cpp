// The one place that names concrete architectures.
#include <string>

#include "gguf/gguf_reader.h"
#include "models/arch.h"
#include "models/gemma3.h"
#include "models/gemma4.h"

namespace geist::models {

Result<std::unique_ptr<ArchModel>> load_arch(const gguf::GgufFile &file, std::unique_ptr<Backend> backend) {
  const gguf::Value *v = file.find("general.architecture");
  if (!v || !v->as_string()) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing or non-string key 'general.architecture'");
  }
  const std::string arch(*v->as_string());
  if (arch == "gemma3") return load_gemma3(file, std::move(backend));
  if (arch == "gemma4") return load_gemma4(file, std::move(backend));
  return GEIST_ERROR(GEIST_E_UNSUPPORTED, "architecture '%s' is not supported (geist runs: gemma3, gemma4)",
                     arch.c_str());
}

}  // namespace geist::models
