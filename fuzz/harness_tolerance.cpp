// libFuzzer harness for the tolerance and certificate readers: the bytes are a tolerance document
// for verify::parse_tolerance and, when they are JSON at all, a certificate for
// verify::certificate_from_json. Both may only return or throw qed::Error; anything else that
// escapes (an nlohmann exception, say) aborts the run as a finding. The harness's first finding,
// a double-overflowing number (2e444) escaping parse_tolerance as json::out_of_range, is fixed:
// every reader now catches nlohmann::json::exception.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "verify/certificate.hpp"
#include "verify/tolerance.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  bool json = true;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    json = false;
  }
  try {
    (void)qed::verify::parse_tolerance(text, "fuzz.json");
  } catch (const qed::Error&) {
  }
  if (!json) return 0;  // the certificate reader is only ever handed parsed JSON
  try {
    (void)qed::verify::certificate_from_json(j, "fuzz.json");
  } catch (const qed::Error&) {
  }
  return 0;
}
