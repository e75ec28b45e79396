// The umbrella header: everything gradwire offers a user.
#pragma once

#include "gradwire/config.h"
#include "gradwire/core/check.h"
#include "gradwire/core/env.h"
#include "gradwire/core/error.h"
#include "gradwire/core/future.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/dlpack.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/tensor.h"
#include "gradwire/tensor/wire.h"
