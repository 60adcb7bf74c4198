// Interface discovery: getifaddrs for addresses, sysfs for state and speed,
// hwloc (or sysfs) for NUMA/PCI locality; plus subnet arithmetic and the
// host identity (boot id + hostname + network namespace).
#include <arpa/inet.h>
#include <hwloc.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tandem/netif.h"

namespace tandem {
namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

int read_int(const std::string& path, int fallback) {
  std::string s = read_first_line(path);
  if (s.empty()) return fallback;
  try {
    return std::stoi(s);
  } catch (const std::exception&) {
    return fallback;
  }
}

int prefix_from_mask(const sockaddr* mask, int family) {
  if (!mask) return family == 4 ? 32 : 128;
  const unsigned char* bytes;
  size_t n;
  if (family == 4) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    n = 16;
  }
  int bits = 0;
  for (size_t i = 0; i < n; ++i) bits += __builtin_popcount(bytes[i]);
  return bits;
}

// Parses an address into 16 bytes (IPv4 in the first 4); returns the family or 0.
int parse_address(const std::string& text, std::array<unsigned char, 16>& out) {
  out.fill(0);
  if (inet_pton(AF_INET, text.c_str(), out.data()) == 1) return 4;
  if (inet_pton(AF_INET6, text.c_str(), out.data()) == 1) return 6;
  return 0;
}

void mask_to_prefix(std::array<unsigned char, 16>& a, int prefix) {
  for (int i = 0; i < 16; ++i) {
    int keep = std::clamp(prefix - 8 * i, 0, 8);
    a[size_t(i)] &= static_cast<unsigned char>(keep == 0 ? 0 : 0xFF << (8 - keep));
  }
}

// NUMA node and PCI bus id of each network OS device hwloc knows, by name.
void add_hwloc_locality(std::vector<NetInterface>& interfaces) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) == 0) {
    for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
      if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK || !os->name) continue;
      for (auto& itf : interfaces) {
        if (itf.name != os->name) continue;
        hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(topo, os);
        if (parent && parent->nodeset) {
          int node = hwloc_bitmap_first(parent->nodeset);
          // Only a single-node ancestor says "this NIC is local to node N".
          if (node >= 0 && hwloc_bitmap_weight(parent->nodeset) == 1) itf.numa_node = node;
        }
        for (hwloc_obj_t p = os->parent; p; p = p->parent) {
          if (p->type != HWLOC_OBJ_PCI_DEVICE) continue;
          char bus[32];
          std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%01x", p->attr->pcidev.domain, p->attr->pcidev.bus,
                        p->attr->pcidev.dev, p->attr->pcidev.func);
          itf.pci_bus_id = bus;
          break;
        }
      }
    }
  }
  hwloc_topology_destroy(topo);
}

}  // namespace

std::optional<std::string> subnet_of(const std::string& address, int prefix) {
  std::array<unsigned char, 16> a;
  int family = parse_address(address, a);
  if (family == 0 || prefix < 0 || prefix > (family == 4 ? 32 : 128)) return std::nullopt;
  mask_to_prefix(a, prefix);
  char text[INET6_ADDRSTRLEN];
  inet_ntop(family == 4 ? AF_INET : AF_INET6, a.data(), text, sizeof text);
  return std::string(text) + "/" + std::to_string(prefix);
}

bool in_subnet(const std::string& address, const std::string& network_address, int prefix) {
  std::array<unsigned char, 16> a, n;
  int fa = parse_address(address, a), fn = parse_address(network_address, n);
  if (fa == 0 || fa != fn || prefix < 0 || prefix > (fa == 4 ? 32 : 128)) return false;
  mask_to_prefix(a, prefix);
  mask_to_prefix(n, prefix);
  return a == n;
}

std::vector<NetInterface> discover_interfaces(bool with_hwloc) {
  std::vector<NetInterface> out;
  auto entry = [&](const std::string& name) -> NetInterface& {
    for (auto& i : out)
      if (i.name == name) return i;
    out.push_back(NetInterface{});
    out.back().name = name;
    return out.back();
  };
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_name) continue;
    NetInterface& itf = entry(ifa->ifa_name);
    itf.up = (ifa->ifa_flags & IFF_UP) != 0;
    itf.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    if (!ifa->ifa_addr) continue;
    int family = ifa->ifa_addr->sa_family == AF_INET ? 4 : ifa->ifa_addr->sa_family == AF_INET6 ? 6 : 0;
    if (family == 0) continue;  // AF_PACKET etc.
    char text[INET6_ADDRSTRLEN] = {};
    const void* src = family == 4
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr);
    inet_ntop(family == 4 ? AF_INET : AF_INET6, src, text, sizeof text);
    itf.addresses.push_back({text, prefix_from_mask(ifa->ifa_netmask, family), family});
  }
  freeifaddrs(list);
  for (auto& itf : out) {
    const std::string sys = "/sys/class/net/" + itf.name;
    itf.operstate = read_first_line(sys + "/operstate");
    if (itf.operstate == "down" || itf.operstate == "lowerlayerdown" || itf.operstate == "notpresent") itf.up = false;
    // Reading speed fails (EINVAL) on interfaces without carrier or a driver figure.
    itf.speed_mbps = read_int(sys + "/speed", -1);
    if (itf.speed_mbps <= 0) itf.speed_mbps = -1;
    itf.numa_node = read_int(sys + "/device/numa_node", -1);
  }
  if (with_hwloc) add_hwloc_locality(out);
  return out;
}

HostIdentity local_host_identity() {
  HostIdentity id;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) id.hostname = name;
  id.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) == 0) id.netns = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  return id;
}

}  // namespace tandem
