#include "gradwire/c10d/rendezvous.h"

#include <cctype>
#include <map>
#include <string>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/check.h"
#include "gradwire/core/env.h"

namespace gradwire::c10d {

namespace {

struct Url {
  std::string scheme;
  std::string rest;  // between "://" and '?'
  std::map<std::string, std::string> query;
};

std::string percent_decode(std::string_view text, const std::string& url) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      GRADWIRE_CHECK_ARG(i + 2 < text.size() &&
                         std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
                         std::isxdigit(static_cast<unsigned char>(text[i + 2])))
          << "rendezvous: bad percent escape in '" << url << "'";
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

Url parse_url(const std::string& url) {
  Url u;
  const size_t sep = url.find("://");
  GRADWIRE_CHECK_ARG(sep != std::string::npos && sep > 0)
      << "rendezvous: '" << url << "' is not a URL (expected env://, tcp://host:port?... or "
      << "file:///path?...)";
  u.scheme = url.substr(0, sep);
  std::string tail = url.substr(sep + 3);
  const size_t q = tail.find('?');
  u.rest = percent_decode(tail.substr(0, q), url);
  if (q != std::string::npos) {
    std::string_view query(tail);
    query.remove_prefix(q + 1);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      std::string_view item = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      GRADWIRE_CHECK_ARG(eq != std::string_view::npos && eq > 0)
          << "rendezvous: query parameter '" << item << "' in '" << url << "' is not name=value";
      u.query[std::string(item.substr(0, eq))] = percent_decode(item.substr(eq + 1), url);
    }
  }
  return u;
}

// A required integer: the query parameter if present, else the environment variable (when
// `env_name` is given). Errors name whichever was missing or malformed.
int64_t required_int(const Url& u, const std::string& param, const std::string& env_name,
                     int64_t min, int64_t max, const std::string& url) {
  auto it = u.query.find(param);
  if (it != u.query.end())
    return parse_int("rendezvous parameter '" + param + "'", it->second, min, max);
  if (!env_name.empty()) {
    const auto raw = env_raw(env_name);
    GRADWIRE_CHECK_ARG(raw && !raw->empty())
        << "rendezvous '" << url << "': environment variable " << env_name << " is not set";
    return parse_int(env_name, *raw, min, max);
  }
  GRADWIRE_THROW(InvalidArgument) << "rendezvous '" << url << "': missing query parameter '"
                                  << param << "'";
}

RendezvousResult tcp_rendezvous(const std::string& host, uint16_t port, int rank, int world_size,
                                std::chrono::milliseconds timeout) {
  TCPStoreOptions options;
  options.host = host;
  options.port = port;
  options.is_master = rank == 0;
  options.world_size = world_size;
  options.wait_for_workers = true;
  options.timeout = timeout;
  options.connect_timeout = timeout;
  return {std::make_shared<TCPStore>(options), rank, world_size};
}

}  // namespace

RendezvousResult rendezvous(const std::string& url, std::chrono::milliseconds timeout) {
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << "rendezvous: timeout must be positive, got " << timeout.count() << " ms";
  const Url u = parse_url(url);
  const bool from_env = u.scheme == "env";
  const int world_size = static_cast<int>(
      required_int(u, "world_size", from_env ? "WORLD_SIZE" : "", 1, 1 << 24, url));
  const int rank =
      static_cast<int>(required_int(u, "rank", from_env ? "RANK" : "", 0, 1 << 24, url));
  GRADWIRE_CHECK_ARG(rank < world_size)
      << "rendezvous '" << url << "': rank " << rank << " is outside [0, " << world_size << ")";

  if (from_env) {
    GRADWIRE_CHECK_ARG(u.rest.empty())
        << "rendezvous '" << url << "': env:// takes no host or path (it reads MASTER_ADDR)";
    const auto addr = env_raw("MASTER_ADDR");
    GRADWIRE_CHECK_ARG(addr && !addr->empty())
        << "rendezvous '" << url << "': environment variable MASTER_ADDR is not set";
    const auto port_text = env_raw("MASTER_PORT");
    GRADWIRE_CHECK_ARG(port_text && !port_text->empty())
        << "rendezvous '" << url << "': environment variable MASTER_PORT is not set";
    const auto port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port_text, 1, 65535));
    return tcp_rendezvous(*addr, port, rank, world_size, timeout);
  }
  if (u.scheme == "tcp") {
    // host:port, host may be a bracketed IPv6 literal.
    std::string host;
    std::string port_text;
    if (!u.rest.empty() && u.rest.front() == '[') {
      const size_t close = u.rest.find(']');
      GRADWIRE_CHECK_ARG(close != std::string::npos && close + 1 < u.rest.size() &&
                         u.rest[close + 1] == ':')
          << "rendezvous '" << url << "': expected tcp://[ipv6]:port";
      host = u.rest.substr(1, close - 1);
      port_text = u.rest.substr(close + 2);
    } else {
      const size_t colon = u.rest.rfind(':');
      GRADWIRE_CHECK_ARG(colon != std::string::npos && colon > 0)
          << "rendezvous '" << url << "': expected tcp://host:port";
      host = u.rest.substr(0, colon);
      port_text = u.rest.substr(colon + 1);
    }
    const auto port = static_cast<uint16_t>(parse_int("tcp:// port", port_text, 1, 65535));
    return tcp_rendezvous(host, port, rank, world_size, timeout);
  }
  if (u.scheme == "file") {
    GRADWIRE_CHECK_ARG(!u.rest.empty() && u.rest.front() == '/')
        << "rendezvous '" << url << "': expected file:///absolute/path";
    FileStoreOptions options;
    options.path = u.rest;
    options.num_workers = world_size;
    options.timeout = timeout;
    return {std::make_shared<FileStore>(options), rank, world_size};
  }
  GRADWIRE_THROW(InvalidArgument) << "rendezvous: unknown scheme '" << u.scheme << "' in '" << url
                                  << "' (expected env, tcp or file)";
}

}  // namespace gradwire::c10d
