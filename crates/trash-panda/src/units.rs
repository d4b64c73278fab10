//! Byte sizes as users write them ("9GB", "1.5GiB", "500MB").
