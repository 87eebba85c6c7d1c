from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []

    operations = [
        migrations.CreateModel(
            name="Write",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("group", models.CharField(max_length=50)),
                ("partition", models.CharField(max_length=50)),
                ("position", models.BigIntegerField()),
                ("n", models.IntegerField()),
                ("pid", models.IntegerField()),
                ("attempt", models.IntegerField()),
            ],
        ),
    ]
