# FindCudnnFrontend: the header-only cuDNN frontend (cudnn_frontend.h, graph API), never vendored.
# Sets CudnnFrontend_FOUND, CUDNN_FRONTEND_INCLUDE_DIR, CudnnFrontend_VERSION and the imported
# target CudnnFrontend::CudnnFrontend (include dir as SYSTEM, CUDNN_FRONTEND_SKIP_JSON_LIB: no
# nlohmann-json from the frontend; links CUDA::nvrtc when the CUDA toolkit was found). Searched, in order: CUDNN_FRONTEND_ROOT (CMake or env var),
# the repository's .deps/cudnn_frontend (scripts/fetch_cudnn_frontend.sh), the active Python's
# site-packages include/ (pip install nvidia-cudnn-frontend puts the headers there), /usr/include.
set(_cfe_hints ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT} ${PROJECT_SOURCE_DIR}/.deps/cudnn_frontend)
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c
                  "import sysconfig; print(sysconfig.get_paths()['purelib']); print(sysconfig.get_paths()['platlib'])"
                  OUTPUT_VARIABLE _cfe_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REPLACE "\n" ";" _cfe_py "${_cfe_py}")
  list(APPEND _cfe_hints ${_cfe_py})
endif()
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_cfe_hints} PATH_SUFFIXES include
          PATHS /usr/include /usr/local/include)
if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _cfe_ver
       REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION +[0-9]+")
  string(REGEX REPLACE ".*MAJOR_VERSION +([0-9]+).*" "\\1" _maj "${_cfe_ver}")
  string(REGEX REPLACE ".*MINOR_VERSION +([0-9]+).*" "\\1" _min "${_cfe_ver}")
  string(REGEX REPLACE ".*PATCH_VERSION +([0-9]+).*" "\\1" _pat "${_cfe_ver}")
  set(CudnnFrontend_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CudnnFrontend REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR
                                  VERSION_VAR CudnnFrontend_VERSION)
if(CudnnFrontend_FOUND AND NOT TARGET CudnnFrontend::CudnnFrontend)
  add_library(CudnnFrontend::CudnnFrontend INTERFACE IMPORTED)
  set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS CUDNN_FRONTEND_SKIP_JSON_LIB)
  if(TARGET CUDA::nvrtc)  # the frontend's runtime-compiled engines (1.3x) call NVRTC
    set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES INTERFACE_LINK_LIBRARIES CUDA::nvrtc)
  endif()
endif()
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR)
