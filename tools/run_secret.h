// gradwire-run's job secret: which secret a job uses, and the private file through which a
// secret the launcher made up reaches its workers.
//
// A job whose user set GRADWIRE_SECRET or GRADWIRE_SECRET_FILE uses that secret: the
// launcher's store and every worker read it from the environment, which the workers
// inherit. A single-node job without one gets a fresh secret of its own: the launcher's
// store requires it, and the workers are told where to read it (GRADWIRE_SECRET_FILE,
// naming a file only this user can read, in a directory of its own that the launcher
// removes when it exits), so that their stores and rpc agents require it too. Nobody
// outside the job needs it: every worker of a single-node job runs on this host and was
// started by this launcher. A job of several nodes cannot make one up (the nodes would
// not agree), so without a user's secret it runs unauthenticated and says so at start.
//
// Thread-safety: plain values; generate_secret reads the kernel's random generator.
// Errors: generate_secret throws gradwire::Error when the generator fails; SecretFile
// throws std::runtime_error naming the path that could not be made or written.
#pragma once

#include <string>

namespace gradwire::run {

// A fresh secret: 32 bytes of the kernel's cryptographic generator, as 64 hex digits.
std::string generate_secret();

// `secret` in a new file of mode 0600 ("secret", in a directory of mode 0700 made for it
// under $TMPDIR, else /tmp); both are removed when this object is destroyed.
class SecretFile {
 public:
  explicit SecretFile(const std::string& secret);
  ~SecretFile();
  SecretFile(const SecretFile&) = delete;
  SecretFile& operator=(const SecretFile&) = delete;

  // The file's absolute path (what the workers' GRADWIRE_SECRET_FILE names).
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

}  // namespace gradwire::run
