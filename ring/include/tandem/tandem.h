// libtandem: everything a framework integrator needs.
#pragma once

#include "tandem/bootstrap.h"
#include "tandem/communicator.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"
#include "tandem/ring/ring.h"
#include "tandem/types.h"
