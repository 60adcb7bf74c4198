// The `dtrain_network_interface` syntax (netif.h lists it). Parsing is
// strict: anything ambiguous is an InvalidArgument quoting the text.
#include <algorithm>
#include <cctype>

#include "tandem/errors.h"
#include "tandem/netif.h"

namespace tandem {
namespace {

constexpr const char* kSyntax =
    "expected e.g. eth0, eth,ib (prefixes), =eth0 (exact), ^docker,lo (exclude), or per host "
    "host1:eth0;host2:ens5;*:eth";

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t end = s.find(sep, pos);
    out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return out;
    pos = end + 1;
  }
}

[[noreturn]] void bad(const std::string& whole, const std::string& why) {
  throw InvalidArgument("tandem: network interface override '" + whole + "': " + why + "; " + kSyntax);
}

// Interface names are at most 15 characters (IFNAMSIZ - 1) without '/', ':', whitespace or ','.
void check_name(const std::string& whole, const std::string& name) {
  if (name.empty()) bad(whole, "empty interface pattern");
  if (name.size() > 15) bad(whole, "'" + name + "' is longer than an interface name can be (15)");
  for (char c : name) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '=' || c == '^' || c == ':' || c == ';')
      bad(whole, "'" + name + "' is not an interface name or prefix");
  }
}

InterfaceFilter parse_filter(const std::string& whole, std::string spec) {
  InterfaceFilter f;
  spec = trim(spec);
  if (!spec.empty() && spec[0] == '^') {
    f.exclude = true;
    spec = trim(spec.substr(1));
  }
  if (spec.empty()) bad(whole, "no interface given");
  for (std::string item : split(spec, ',')) {
    item = trim(item);
    InterfaceFilter::Pattern p;
    if (!item.empty() && item[0] == '=') {
      p.exact = true;
      item = trim(item.substr(1));
    }
    check_name(whole, item);
    p.text = item;
    f.patterns.push_back(p);
  }
  return f;
}

}  // namespace

bool InterfaceFilter::allows(const std::string& name, const std::vector<std::string>& host_names) const {
  bool matched = false;
  for (const auto& p : patterns) {
    bool host_has_exact = std::find(host_names.begin(), host_names.end(), p.text) != host_names.end();
    if (p.exact || host_has_exact) {
      matched = matched || name == p.text;
    } else {
      matched = matched || name.compare(0, p.text.size(), p.text) == 0;
    }
  }
  return exclude ? !matched : matched;
}

std::string InterfaceFilter::to_string() const {
  std::string s = exclude ? "^" : "";
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (i) s += ',';
    if (patterns[i].exact) s += '=';
    s += patterns[i].text;
  }
  return s;
}

std::optional<InterfaceFilter> InterfaceOverride::for_host(const std::string& hostname) const {
  for (const auto& [host, filter] : per_host)
    if (host == hostname) return filter;
  return all_hosts;
}

InterfaceOverride parse_interface_override(const std::string& text) {
  InterfaceOverride o;
  o.text = text;
  const std::string t = trim(text);
  if (t.empty()) return o;
  // The per-host form is recognised by its ':' (interface names cannot hold one).
  if (t.find(':') == std::string::npos) {
    if (t.find(';') != std::string::npos) bad(text, "';' separates per-host entries, each written host:interfaces");
    o.all_hosts = parse_filter(text, t);
    return o;
  }
  for (std::string entry : split(t, ';')) {
    entry = trim(entry);
    if (entry.empty()) continue;  // tolerate a trailing ';'
    size_t colon = entry.find(':');
    if (colon == std::string::npos) bad(text, "entry '" + entry + "' has no host: in front of its interfaces");
    std::string host = trim(entry.substr(0, colon));
    if (host.empty()) bad(text, "entry '" + entry + "' has an empty host name (use * for every other host)");
    if (host.find_first_of(" \t,=^") != std::string::npos) bad(text, "'" + host + "' is not a host name");
    InterfaceFilter f = parse_filter(text, entry.substr(colon + 1));
    if (host == "*") {
      if (o.all_hosts) bad(text, "'*' is given twice");
      o.all_hosts = f;
      continue;
    }
    for (const auto& [h, _] : o.per_host)
      if (h == host) bad(text, "host '" + host + "' is given twice");
    o.per_host.emplace_back(host, f);
  }
  if (o.empty()) bad(text, "no entries");
  return o;
}

}  // namespace tandem
