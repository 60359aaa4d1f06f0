# npubridge_add_plugin(<target> SOURCES <files...> [OUTPUT_DIR <dir>])
#
# Builds a plugin: a shared library that links only the plugin C ABI
# (npubridge::plugin_api, header-only), hides every symbol but the entry point
# (-fvisibility=hidden and a version script) and is loaded at run time.
# Used in tree and by third parties after find_package(npubridge).
set(NPUB_PLUGIN_MAP ${CMAKE_CURRENT_LIST_DIR}/plugin.map)

function(npubridge_add_plugin target)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET npubridge_plugin_api)
    target_link_libraries(${target} PRIVATE npubridge_plugin_api)
  else()
    target_link_libraries(${target} PRIVATE npubridge::npubridge_plugin_api)
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${NPUB_PLUGIN_MAP}" "LINKER:--no-undefined")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${NPUB_PLUGIN_MAP})
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  endif()
endfunction()
