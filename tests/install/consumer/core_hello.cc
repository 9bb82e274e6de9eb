// tests/install/consumer/core_hello.cc: a program built against an installed
// vmmc::core. Two contexts of this process: one exports a buffer, the other
// imports it and sends a message into it with a notification; prints the
// path, the notification and the bytes that arrived.
#include <chrono>
#include <cstdio>

#include "vmmc/core/context.h"

int main() {
  using namespace vmmc::core;
  context_options options;
  options.fabric_on_demand = true;  // same host: the mapped path, no libfabric
  auto exporter = context::create(options);
  auto importer = context::create(options);
  if (!exporter || !importer) {
    std::fprintf(stderr, "core_hello: no context\n");
    return 1;
  }
  auto inbox = exporter->allocate(4096);
  if (!inbox) return 1;
  notification got{};
  export_options o;
  o.on_notify = [&](const notification& n) { got = n; };
  auto exported = exporter->export_buffer("inbox", inbox->data(), inbox->size(), o);
  auto peer = importer->import_buffer(exporter->address(), "inbox");
  if (!exported || !peer) {
    std::fprintf(stderr, "core_hello: export/import failed: %s\n", peer.error().message().c_str());
    return 1;
  }
  static const char text[] = "hello through vmmc";
  if (!importer->send(*peer, 64, text, sizeof text, {.notify = true, .value = 7})) return 1;
  auto waited = exporter->wait_notifications(std::chrono::seconds(5));
  if (!waited || *waited != 1) {
    std::fprintf(stderr, "core_hello: no notification\n");
    return 1;
  }
  std::printf("path %s, notification value %llu at %llu, %llu bytes: %s\n",
              importer->path_of(*peer)->c_str(), static_cast<unsigned long long>(got.value),
              static_cast<unsigned long long>(got.offset),
              static_cast<unsigned long long>(got.length),
              reinterpret_cast<const char*>(inbox->data()) + 64);
  return 0;
}
