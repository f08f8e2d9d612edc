-- Reserve 20% of each heap page for HOT updates of in-window counter increments.
-- Affects pages filled from now on; existing pages are not rewritten.
ALTER TABLE public.runlimit_fixed_windows SET (fillfactor = 80);
