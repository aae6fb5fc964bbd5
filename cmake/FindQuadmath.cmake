# Finds GCC's libquadmath, needed by boost::multiprecision::float128; defines Quadmath::Quadmath.
find_library(QUADMATH_LIBRARY NAMES quadmath libquadmath.so.0
  HINTS /usr/lib/gcc/x86_64-linux-gnu/12 /usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Quadmath REQUIRED_VARS QUADMATH_LIBRARY)
if(Quadmath_FOUND AND NOT TARGET Quadmath::Quadmath)
  add_library(Quadmath::Quadmath UNKNOWN IMPORTED)
  set_target_properties(Quadmath::Quadmath PROPERTIES IMPORTED_LOCATION "${QUADMATH_LIBRARY}")
endif()
mark_as_advanced(QUADMATH_LIBRARY)
