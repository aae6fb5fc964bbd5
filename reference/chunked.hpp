// The chunked (WY / UT transform) reference, MATH.md §4 and §6: chunked_forward and
// chunked_backward for every variant and arm, exact in exact arithmetic (it equals the recurrent
// reference), and with ChunkOptions a CPU twin of a tensor-core kernel's operand rounding.
#pragma once

#include "reference/chunked_backward.hpp"
#include "reference/chunked_core.hpp"
#include "reference/chunked_forward.hpp"
#include "reference/rounding.hpp"
