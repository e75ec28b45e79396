// Everything of gradwire::ddp: DistributedDataParallel, the Reducer, communication hooks,
// Join and DistributedSampler (docs/ddp.md is the guide).
#pragma once

#include "gradwire/ddp/comm_hooks.h"
#include "gradwire/ddp/distributed_data_parallel.h"
#include "gradwire/ddp/distributed_sampler.h"
#include "gradwire/ddp/grad_bucket.h"
#include "gradwire/ddp/join.h"
#include "gradwire/ddp/reducer.h"
