// The one exception type of qedcheck: a message that names the file, the dataset, the index and
// the rule broken. The command line maps it to exit code 2 (bad input).
#pragma once

#include <stdexcept>
#include <string>

namespace qed {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace qed
