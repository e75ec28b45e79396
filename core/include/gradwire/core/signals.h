// Process-wide signal settings gradwire needs, made once and only when the program has not
// chosen otherwise.
//
// ignore_sigpipe(): transports that write to sockets without MSG_NOSIGNAL (Gloo, TensorPipe's
// uv transport) would have a peer that dies mid-transfer kill this process with SIGPIPE,
// instead of failing the operation with an error naming the peer. The first call sets
// SIGPIPE to SIG_IGN when it still has its default action (a handler or disposition the
// program installed is left alone); write() then fails with EPIPE, which the transports
// report. Later calls do nothing.
//
// Thread-safety: may be called from any thread.
#pragma once

namespace gradwire {

void ignore_sigpipe();

}  // namespace gradwire
