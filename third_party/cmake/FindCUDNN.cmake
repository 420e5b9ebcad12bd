# FindCUDNN: CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION and the imported target CUDNN::CUDNN.
# Searches CUDNN_ROOT / $CUDNN_HOME, the CUDA toolkit and the system paths. The version
# actually loaded at run time is checked by the code (cudnnGetVersion), not here.
find_path(CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_HOME} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_HOME} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_ver REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  string(REGEX REPLACE ".*CUDNN_MAJOR +([0-9]+).*" "\\1" _maj "${_cudnn_ver}")
  string(REGEX REPLACE ".*CUDNN_MINOR +([0-9]+).*" "\\1" _min "${_cudnn_ver}")
  string(REGEX REPLACE ".*CUDNN_PATCHLEVEL +([0-9]+).*" "\\1" _pat "${_cudnn_ver}")
  set(CUDNN_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
