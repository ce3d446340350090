from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("reference", models.CharField(max_length=64, unique=True)),
                ("confirmed", models.BooleanField(default=False)),
                ("job_id", models.CharField(blank=True, max_length=64)),
            ],
        ),
    ]
