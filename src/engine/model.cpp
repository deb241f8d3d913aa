#include "engine/model.h"

#include <xxhash.h>

#include "base/timer.h"

namespace geist {

Result<std::unique_ptr<Model>> Model::finish(std::unique_ptr<gguf::GgufFile> f, const ModelParams &p, double t0) {
  std::unique_ptr<Backend> backend;
  GEIST_ASSIGN_OR_RETURN(backend, make_backend(p.backend, p.device));
  std::string device = backend->device();
  std::unique_ptr<models::ArchModel> arch;
  GEIST_ASSIGN_OR_RETURN(arch, models::load_arch(*f, std::move(backend)));
  Result<Tokenizer> tok = Tokenizer::from_gguf(*f);
  if (!tok) return tok.status();
  if (tok->n_vocab() > arch->info().n_vocab) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer has %d tokens but the output head only %lld rows",
                       tok->n_vocab(), (long long)arch->info().n_vocab);
  }
  std::unique_ptr<Model> m(new Model(std::move(f), std::move(tok).value(), std::move(arch)));
  m->device_ = std::move(device);
  m->fingerprint_ = XXH3_64bits(m->file_->base(), static_cast<size_t>(m->file_->data_offset()));
  if (p.prefetch) m->file_->advise_willneed();
  m->load_seconds_ = now_seconds() - t0;
  return m;
}

Result<std::unique_ptr<Model>> Model::load(const std::string &path, const ModelParams &p) {
  const double t0 = now_seconds();
  std::unique_ptr<gguf::GgufFile> f;
  GEIST_ASSIGN_OR_RETURN(f, gguf::GgufFile::open(path));
  return finish(std::move(f), p, t0);
}

Result<std::unique_ptr<Model>> Model::load_from_memory(const void *data, size_t size, const ModelParams &p) {
  const double t0 = now_seconds();
  std::unique_ptr<gguf::GgufFile> f;
  GEIST_ASSIGN_OR_RETURN(f, gguf::GgufFile::from_memory(data, size));
  return finish(std::move(f), p, t0);
}

}  // namespace geist
