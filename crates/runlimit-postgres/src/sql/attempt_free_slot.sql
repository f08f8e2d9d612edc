SELECT slot::integer AS slot
FROM pg_catalog.generate_series(0, $2 - 1) AS slot
WHERE NOT EXISTS (
    SELECT 1
    FROM public.runlimit_attempts AS a
    WHERE a.capacity_shard = $1 AND a.capacity_slot = slot
)
LIMIT 1
