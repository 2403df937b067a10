# ctest steps for an outside CMake project (tests/consumer):
#   MODE=install  install the package into a temp prefix, then configure, build and run the
#                 project with find_package(crossknn 0.1 CONFIG REQUIRED);
#   MODE=subdir   the same project with the source tree added by add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
if(MODE STREQUAL "subdir")
  run(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${WORK_DIR}/build_subdir -G ${GENERATOR}
      -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_CXX_COMPILER=${CXX}
      -DCROSSKNN_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build_subdir -j2)
  run(${WORK_DIR}/build_subdir/consumer ${FIXTURE}/items.npy)
  file(READ ${WORK_DIR}/build_subdir/crossknn/cpp/cmake_install.cmake inst)
  if(inst MATCHES "crossknnTargets")
    message(FATAL_ERROR "add_subdirectory must not install the C++ package")
  endif()
  return()
endif()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/crossknn/features.h include/crossknn/search.h lib/cmake/crossknn/crossknnConfig.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
foreach(f features_impl.h kernels.h)
  if(EXISTS ${prefix}/include/crossknn/${f})
    message(FATAL_ERROR "private header installed: ${f}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer ${FIXTURE}/items.npy)

