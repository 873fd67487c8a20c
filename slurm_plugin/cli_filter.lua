-- SPDX-License-Identifier: BSD-3-Clause
-- cli_filter.lua — mall's submission filter for sbatch/salloc/srun (Slurm's cli_filter/lua plugin).
-- A SPANK plugin cannot change a job's request in Slurm 22.05, so this filter does the part of
-- `--malleable=MIN[:MAX][,weight=W]` that must happen at submission: with no -c/--cpus-per-task it
-- asks Slurm for MIN cpus per task (the cores the job is guaranteed); with -c it refuses values
-- outside MIN..MAX, saying how to fix the command (the weight is the plugin's business). Install it
-- as cli_filter.lua next to slurm.conf and set CliFilterPlugins=cli_filter/lua. Bad --malleable
-- values are refused earlier by the plugin itself.

function slurm_cli_setup_defaults(options, early)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
  local spank = options["spank"]
  local value = spank and spank["mall"] and spank["mall"]["malleable"]
  if value == nil then return slurm.SUCCESS end
  -- The cores come first, before any ",weight=W"; "weight=W" alone means the bare option's cores.
  local cores = string.match(value, "^([^,]*)")
  if string.find(cores, "=", 1, true) then cores = "" end
  local min, max = string.match(cores, "^(%d+):(%d+)$")
  if min == nil then min = string.match(cores, "^(%d+)$") end
  if min == nil then return slurm.SUCCESS end  -- bare --malleable: MIN is 1, Slurm's default
  min = tonumber(min)
  max = max and tonumber(max)
  local per_task = tonumber(options["cpus-per-task"]) or 0
  if per_task == 0 then
    options["cpus-per-task"] = tostring(min)
    return slurm.SUCCESS
  end
  if per_task < min or (max ~= nil and per_task > max) then
    slurm.log_error(string.format(
      "--malleable=%s guarantees %d cpus per task, but -c %d asks for %s; drop -c (mall then asks for %d) or give a value in %d..%s",
      value, min, per_task, per_task < min and "fewer" or "more than MAX", min, min, max and tostring(max) or "MAX"))
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
