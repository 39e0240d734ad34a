// The handles of the C API (defined in src/api/api.cc), for the other files
// of the C face.
#pragma once

#include "include/zeppelin.h"
#include "src/core/comm.h"

namespace zp {

// The shape of the handle's communicator (Comm::shape), or the lookup's
// error naming fn.
zpResult_t commShape(zpComm_t comm, const char* fn, CommShape* out);

}  // namespace zp
